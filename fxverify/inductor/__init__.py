"""Inductor's custom-pass hooks, the one home of what fxverify knows about them: which hooks there are and which
capture takes the graphs each receives (:mod:`~fxverify.inductor.hooks`, torch-free: the capture registry reads
it at the plugin's start-up), how each hook is reached offline, as ``torch.compile`` reaches it but without code
generation, and what torch does to the graph right after it.

- :mod:`~fxverify.inductor.graph_hooks`: the joint-graph and post-grad hooks, which Inductor calls on AOTAutograd's
  graphs (:func:`~fxverify.inductor.graph_hooks.graph_at_hook`, used by the captures and by pattern fuzzing alike);
- :mod:`~fxverify.inductor.pre_grad`: ``pre_grad_custom_pass``, on Dynamo's graph;
- :mod:`~fxverify.inductor.freezing`: freezing's pattern loop (``config.freezing=True``);
- :mod:`~fxverify.inductor.after`: what torch does after any of them (:func:`~fxverify.inductor.after.carried_on`);
- :mod:`~fxverify.inductor.stops`, :mod:`~fxverify.inductor.fake_mode`, :mod:`~fxverify.inductor.order`,
  :mod:`~fxverify.inductor.aot`: stopping Inductor at a hook, the fake mode its passes run in, why a graph has no
  topological order, the roles of AOTAutograd's graph inputs and outputs.

This layer knows torch, not fxverify's notions (a transform is named by its spec in what it raises, a capture by
its name): the captures (:mod:`fxverify.capture`) and pattern fuzzing (:mod:`fxverify.compile`) build on it.
Importing this package imports no torch.
"""
