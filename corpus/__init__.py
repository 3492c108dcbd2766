"""The shipped model catalogue (``models.toml``), installed as ``fxverify.corpus``."""
