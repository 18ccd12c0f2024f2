"""Convert stage: TorchScript -> pnnx -> ncnn param/bin, gated and patched declaratively."""
