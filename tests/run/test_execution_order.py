"""The order a sweep runs its work in (moebench/run/launch.py execution_order): a worker keeps one
model's expert weights, so two models of one hidden size must not alternate (each combination
would rebuild its weights, and its device peak would carry the build's cached blocks)."""

from types import SimpleNamespace

from moebench.run.launch import execution_order


def _work(family, hidden, model, n):
    return (SimpleNamespace(family=family, combo=SimpleNamespace(hidden=hidden, model=model), n=n), [0])


def test_one_models_combinations_run_adjacent_and_families_stay_together():
    # planned as the planner interleaves them: model inner
    planned = [
        _work("local", 4096, "mixtral_8x7b", 0),
        _work("local", 4096, "glm4_moe", 1),
        _work("local", 2048, "deepseek_v2_lite", 2),
        _work("local", 4096, "mixtral_8x7b", 3),
        _work("local", 4096, "glm4_moe", 4),
        _work("deepep", 4096, "mixtral_8x7b", 5),
    ]
    order = [w[0].n for w in execution_order(planned)]
    assert order == [5, 2, 1, 4, 0, 3]  # families, then hidden, then model: stable inside each
    models = [planned[i][0].combo.model for i in order if planned[i][0].family == "local"]
    # each model's combinations form one block (no alternation)
    blocks = [m for k, m in enumerate(models) if k == 0 or models[k - 1] != m]
    assert len(blocks) == len(set(models))
    # stable inside one model: the planned order kept
    local_mixtral = [i for i in order if (planned[i][0].combo.model, planned[i][0].family) == ("mixtral_8x7b", "local")]
    assert local_mixtral == [0, 3]
