"""A faithful local Cloud TPU: fake TPU API server, capacity model, real SSH worker hosts.

See README.md in this directory. Modules:
- hosts: real sshd worker hosts (WorkerHostManager).
"""
