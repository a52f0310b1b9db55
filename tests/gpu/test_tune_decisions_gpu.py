"""Issue #51 on one H100 / H200, quickly: `moebench tune --decisions`' options all run and check as whole
layers at real shapes (deepseek_v2_lite fp8_block: gathered, with the weights by TMA too, contiguous on
Triton and on every Gluon variant, DeepGEMM where installed), the sidecar written from them parses, and the layer built
beside it runs what was chosen. The full tune and the triton-vs-deepgemm comparison:
scripts/tune_decisions_gpu.sh.

Run: pytest -m gpu tests/gpu/test_tune_decisions_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OVERRIDES = ["experts=triton", "backend=local", "quant=fp8_block", "model=deepseek_v2_lite", "runner.device=cuda"]
TOKENS = [256, 2048]
# the tune's gathered tile at each count (here one fixed vLLM fp8 tile): the gathered options run on it,
# gathered-btma with the weights' tiles by TMA
TILE = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)


def test_every_decision_runs_and_the_layer_takes_the_chosen_one(tmp_path, monkeypatch):
    from moebench.kernels.triton import config as tconfig
    from moebench.kernels.triton import decisions as kdec
    from moebench.kernels.triton.gluon_contiguous import GLUON_EXTRAS, GLUON_VARIANTS
    from moebench.measure import layer as layers
    from moebench.measure.workload import make_inputs
    from moebench.tune import decide, decision_files
    from moebench.tune.bench import dims_of
    from moebench.tune.search import resolve

    c, _ = resolve(OVERRIDES + [f"workload.tokens_per_rank=[{','.join(map(str, TOKENS))}]"])
    dev = torch.device("cuda", torch.cuda.current_device())
    found = decide.decide(c, TOKENS, {T: T for T in TOKENS}, {T: TILE for T in TOKENS}, 5, dev, print)
    for r in found:
        names = {t.option for t in r.timed}
        gluons = sum(n.startswith("contiguous/gluon") for n in names)
        assert gluons == len(GLUON_VARIANTS) + len(GLUON_EXTRAS), r.not_run
        assert {"current", "gathered", "gathered-btma", "contiguous/triton"} <= names, r.not_run
        bad = [(t.option, t.error) for t in r.timed if t.error]
        assert not bad, bad
        assert r.best and r.entry, r
        # what the count held on the GPU, the options' shared graph pool included (tune.json records it)
        assert 0 < r.device_peak_bytes <= torch.cuda.get_device_properties(dev).total_memory, r.device_peak_bytes
    print(decision_files.summary(found))
    dims = dims_of(c.combo)
    info = {"E": dims.num_experts, "N": dims.intermediate, "hidden": dims.hidden, "topk": dims.topk}
    tiles = tconfig.config_file_name(dims.num_experts, dims.intermediate, "fp8_w8a8", [128, 128])
    path = decision_files.write(info, found, tmp_path, tiles)
    assert path is not None and kdec.parse(json.loads(path.read_text())).entries
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(path.parent))
    kdec.clear_cache()
    # the tuner's combination pins the gathered rows for the tiles: the layer as a sweep builds it
    built = layers.build_layer(c.combo, 0, 1, None, dev, options={"row_layout": "auto", "contiguous_gemm": "auto"})
    ex = built.kernel.experts
    assert ex.decisions is not None
    for r in found:
        x, w, ids = make_inputs(built.ctx.shape, r.tokens, "uniform", 1.0, 0, 0, 1, "cuda")
        built.kernel(x, w, ids)
        want = r.entry["row_layout"]
        assert ex.last_layout == want, (r.tokens, ex.last_layout, r.entry)
        if want == "contiguous":
            label = r.best.split("/", 1)[1].split(":")[0]  # triton | gluon | gluon_wide
            assert ex.last_gemm == f"{label}/{label}", (r.tokens, ex.last_gemm, r.best)
