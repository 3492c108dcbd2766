"""The shipped model catalogue, installed as ``fxverify.corpus``: ``models.toml`` (the default zoo),
``edge.toml`` (FX edge cases, ``edge_cases.py``), ``layers.toml`` (layer variants, ``layer_variants.py``)
and ``full.toml`` (the generated full zoo, ``generate_full.py``)."""
