"""The command line: `attnserve serve / translate / attention / translate-po / derive`, the start-up checks and the
server process."""
