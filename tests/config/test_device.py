"""runner.device=auto and the GPU count without torch where the answer is certain
(moebench/config/device.py), and torch's answer everywhere else."""

from __future__ import annotations

import pytest
import torch

from moebench.config import device


@pytest.fixture
def linux(monkeypatch):
    monkeypatch.setattr(device.sys, "platform", "linux")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _nodes(monkeypatch, nodes):
    monkeypatch.setattr(device, "gpu_device_nodes", lambda: tuple(nodes))


def _torch_says(monkeypatch, available: bool, count: int = 0):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("visible", ["", " ", "-1", "-1,0"])
def test_cuda_visible_devices_hiding_every_gpu_is_cpu_without_torch(linux, monkeypatch, visible):
    _nodes(monkeypatch, ["/dev/nvidia0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _torch_says(monkeypatch, True, 8)  # never asked
    assert device.no_gpu_for_certain()
    assert (device.resolve_device("auto"), device.cuda_available(), device.cuda_device_count()) == ("cpu", False, 0)


def test_no_gpu_device_node_is_cpu_without_torch(linux, monkeypatch):
    _nodes(monkeypatch, [])
    _torch_says(monkeypatch, True, 8)  # never asked
    assert device.no_gpu_for_certain() and device.resolve_device("auto") == "cpu"


@pytest.mark.parametrize("visible", [None, "0", "1,0", "GPU-8f0e"])
def test_a_gpu_node_asks_torch(linux, monkeypatch, visible):
    _nodes(monkeypatch, ["/dev/nvidia0", "/dev/nvidia1"])
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert not device.no_gpu_for_certain()
    _torch_says(monkeypatch, True, 2)
    assert (device.resolve_device("auto"), device.cuda_device_count()) == ("cuda", 2)
    _torch_says(monkeypatch, False)  # a CPU-only torch build on a GPU host
    assert (device.resolve_device("auto"), device.cuda_device_count()) == ("cpu", 0)


def test_rocm_and_wsl_nodes_ask_torch_too(linux, monkeypatch):
    for node in ("/dev/kfd", "/dev/dxg"):
        _nodes(monkeypatch, [node])
        assert not device.no_gpu_for_certain()


def test_other_systems_ask_torch(monkeypatch):
    monkeypatch.setattr(device.sys, "platform", "darwin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not device.no_gpu_for_certain()


def test_an_explicit_device_is_kept():
    assert device.resolve_device("cpu") == "cpu" and device.resolve_device("cuda") == "cuda"


def test_where_it_is_certain_torch_agrees_on_this_machine():
    if device.no_gpu_for_certain():
        assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    assert device.cuda_available() == torch.cuda.is_available()
    assert device.cuda_device_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
