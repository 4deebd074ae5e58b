"""Daemon layer: the network edge around the ROUTER socket: the private ipc directory, the connection file, the
bound on ipc connections below the open-file limit."""
