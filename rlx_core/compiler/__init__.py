"""One graph compiled for one device, and what a compiled graph needs to run.

``lowering.py`` runs the pass pipeline a backend asks for (once per graph and backend);
``compiled.py`` is ``CompiledGraph``, a graph lowered, planned and compiled on one
device; ``dynamic.py`` compiles a symbolic graph once per shape class; ``inputs.py``
checks run-time inputs; ``memory.py`` keeps graphs off devices too small for them;
``timing.py`` is where the core measures how long running something takes. Choosing the
device is ``rlx_core.placement``'s job, one layer up.
"""
