"""kubesim: a KubeVirt-compatible Kubernetes API server for development, tests and benchmarks."""

__version__ = "0.1.0"
