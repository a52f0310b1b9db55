"""How one rank measures a built layer: timing (timing.py: events held until the host has
enqueued, graph replays, samples), the layer's samples, phases and correctness check
(samples.py), memory (memory.py), derived rates (derived.py), inputs and weights (workload.py),
building a combination's layer (layer.py) and trace capture (capture.py). Imports kernels,
config, traces and util only."""
