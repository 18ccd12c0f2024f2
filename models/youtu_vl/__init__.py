"""Youtu-VL-4B-Instruct port: PyTorch reference from the spec, export split, host pipeline, ModelPort."""
