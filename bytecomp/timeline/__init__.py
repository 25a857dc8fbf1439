"""The iteration timeline: DDP's buckets, the simulators, and trace and PNG output."""
