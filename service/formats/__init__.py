"""Document formats translated through the engine: each parses its format with a real parser and hands the engine
the texts to translate."""
