"""The device side of one step: from a SchedulerOutput to the sampled tokens.

Read in this order:
    model_runner.py   ModelRunner.execute_stages: inputs -> forward pass (or a graph replay) -> sampler
    inputs.py         ForwardBatch (host) and DeviceBatch (device) built from the SchedulerOutput
    forward.py        the forward pass: one loop over layers and their stages
    stages.py         Stage: what a stage ran and produced, the unit the debugger steps
    kernel_plan.py    which kernel every stage launches, per precision, device and batch shape
    choices.py        the names a user picks (precision, KV cache dtype), defined once
    sampler.py        the next token of each sampling row; logprobs.py, the logprobs asked for
    kv_pool.py        the paged KV pool on the device
    cuda_graphs.py, prefill_graphs.py  decode and prefill steps captured per batch bucket and replayed
    step.py           StepResult, and a pipelined decode step still in flight
"""
