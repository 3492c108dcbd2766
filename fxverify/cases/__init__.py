"""Model cases: the corpus catalogue (``catalogue``: entries as plain data and selection over them,
torch-free), input configurations (``inputs``), state randomisation (``state``) and
:class:`~fxverify.cases.case.ModelCase` (``case``: an entry made concrete: fresh seeded instances,
their graphs, their inputs). This package imports nothing itself, so reading the catalogue
imports no torch.
"""
