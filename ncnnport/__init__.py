"""ncnnport: export PyTorch multimodal models to ncnn and prove parity with numbers."""

__version__ = "0.1.0"
