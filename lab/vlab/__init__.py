"""The nspawn lab behind `lab/lab`: Debian 12 machines booted by systemd-nspawn.

Runs as root with the system's python3 (stdlib only). Modules:
  spec       names, subnets and paths of one lab (pure)
  shell      running commands, locks, small file helpers
  registry   which labs exist (lab.json) and their subnet indexes
  rootfs     the cached debootstrap image
  layer      the doubles layer (nvidia-smi, ibstat, fixtures) on top of it
  images     markers, removal and pruning of both
  network    bridges, network namespaces, veth pairs
  cgroups    one cgroup per node (the host's PID 1 is not systemd)
  machines   overlay disks, per-node provisioning, boot and poweroff
  leftovers  what a lab leaves on the host, found by name
  inventory  the Ansible inventory a lab writes
  cli        the command line
supervise.sh runs one node's systemd-nspawn and reboots it when it asks to.
"""
