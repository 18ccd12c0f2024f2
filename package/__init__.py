"""The ncnn package format: param files, the manifest, and the reader every runtime opens a package with."""
