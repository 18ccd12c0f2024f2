"""Parity stage: local (module fed the reference's exact inputs) and propagated (pipeline on its
own outputs) comparisons of ncnn against PyTorch, judged by tolerance policies."""
