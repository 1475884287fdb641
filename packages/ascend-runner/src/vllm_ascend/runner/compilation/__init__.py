"""Graph compilation for the Ascend platform: the post-grad pass manager vLLM's compile backend runs
(:class:`~vllm_ascend.runner.compilation.pass_manager.GraphFusionPassManager`), its fusion passes
(:mod:`.passes`) and their settings, ``additional_config.ascend_compilation_config`` (:mod:`.config`)."""
