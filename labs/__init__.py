"""Lab templates, attempts on KubeVirt VMs and their lifecycle, console bridge, student pages."""
