"""The hardware JPEG decoder probe answers without raising, with a reason, on any machine."""
from __future__ import annotations

import torch

from fastdata.cache import hwjpeg


def test_probe_without_a_library_says_what_to_install(monkeypatch):
    monkeypatch.setattr(hwjpeg, "_candidates", lambda: ["/nonexistent/libnvjpeg.so.99"])
    info = hwjpeg.hardware_jpeg_decoder()
    assert info["available"] is False and info["engines"] == 0
    assert "no libnvjpeg" in info["reason"] and "pip install" in info["reason"]


def test_probe_reports_a_reason_and_no_engines_without_a_gpu(monkeypatch):
    monkeypatch.setenv("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
    info = hwjpeg.hardware_jpeg_decoder()
    assert info["driver_capabilities"] == "compute,utility"
    assert info["reason"]
    if not torch.cuda.is_available():
        assert info["available"] is False and info["engines"] == 0
    elif info["available"]:  # on a GPU the answer depends on the card and the container
        assert info["reason"] == "hardware backend created"
