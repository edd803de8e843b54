"""The portal's only door to the cluster: client configuration, pure manifest builders, streaming subresources."""
