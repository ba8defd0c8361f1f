"""The doors for models trained elsewhere: one module a format, each writing a bundle and checking it against the
runtime the model came from."""
