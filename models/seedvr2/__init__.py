"""SeedVR2-3B one-step video/image restoration, ported to ncnn.

config (real + tiny presets) -> dit / vae / mmrope / windows (fp32 reference written from the
spec, checkpoint names) -> model (build, strict safetensors checkpoint folders) -> pipeline (host
steps + backends) -> wrappers / specs (the export split) -> runner (host side of the graphs) ->
port (the ModelPort hooks).
"""
