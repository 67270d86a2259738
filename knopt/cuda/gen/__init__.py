"""Code generators, one module per family of kernels."""
