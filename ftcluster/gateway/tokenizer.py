"""The gateway's tokenizers; they live in `ftcluster.client.tokenizer` (shared with
`ftcluster client text`), re-exported here."""

from ftcluster.client.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]
