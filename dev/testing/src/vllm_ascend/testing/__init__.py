"""Test oracles and tiny-model builders of the vllm-ascend repository (dev-only; never published).

- ``process``: a script in a fresh interpreter (``run_vllm_script``), a free loopback port.
- ``script_host``: scripts forked from one warm interpreter that imported vLLM once (``ScriptHost``).
- ``tiny_models``: every tiny model family the tests build, on the runner's demo builder.
- ``tiny_drafters``: EAGLE / EAGLE-3 heads and MTP layers next to a tiny target.
- ``hf_reference``, ``draft_reference``: HF transformers oracles (greedy tokens and logits; drafts).
- ``graph_hooks``: hooks that break the graph-replay contract on purpose.
- ``mamba_states``, ``v2_references``: the V2 kernel tests' state-cache builders and reference forms.

``process`` and ``script_host`` need nothing but the standard library (core's tests use ``process``);
``mamba_states`` and ``v2_references`` torch, pytest and the kernels (the triton-ascend lane installs this dist
without dependencies); the rest import the runner, which the ``runner`` extra declares.
"""
