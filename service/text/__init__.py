"""Text around decoding: a text's layout (whitespace, lines, sentences), its protected spans and glossary terms
masked before decoding and placed back after it by cross-attention."""
