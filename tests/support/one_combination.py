"""The one combination many harness tests sweep on the CPU: the tiny model, local backend, torch experts,
4 tokens, three timed samples, no warm-up. A test adds what it needs (`runner.device=cpu`,
`runner.memory=false`, ...) after it."""

ONE_TINY = [
    "backend=local",
    "experts=torch",
    "reduction=experts",
    "overlap=none",
    "quant=bf16",
    "model=tiny",
    "workload.tokens_per_rank=[4]",
    "runner.reps=3",
    "runner.warmup=0",
    "runner.phase_reps=1",
]

# `moebench tune` on that layer with the Triton experts under the interpreter: the small space, two
# samples a screened config, one a finalist (a test adds --out and what it checks)
TINY_TUNE = [
    "tune",
    "experts=triton",
    "backend=local",
    "model=tiny",
    "quant=bf16",
    "runner.device=cpu",
    "workload.tokens_per_rank=[4]",
    "--space",
    "small",
    "--reps",
    "2",
    "--final-reps",
    "1",
]
