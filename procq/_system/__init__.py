"""What procq asks of the operating system: processes, their privileges and
their confinement.

Below everything that starts or confines a process (the supervisor, the
workers, a Dask lane's far side); imports only ``procq._model``.

- ``processes``: processes, their trees, memory and exits; pidfds.
- ``privileges``: what a process lets others do to it (dumpable or not) and
  may do itself (capabilities, ``no_new_privs``, Landlock), and the
  supervisor's "untraceable" latch.
- ``sandbox``: what this kernel can enforce of a ``Sandbox`` (probed once per
  process), and the check that refuses what it cannot (``SandboxUnavailable``).
- ``sandbox_linux``: the mechanics: namespaces, the jobs' read-only view of
  the filesystem, Landlock rules, leftovers reaped.
- ``sandbox_bounds``: what enforces a sandbox's bounds here (processes,
  memory, temporary files), or why nothing can.
- ``cgroups``: the cgroups (v1 or v2) a sandboxed worker's jobs run in.
- ``seccomp``: the seccomp filter, assembled by hand (x86-64 and aarch64).
- ``egress_bridge``, ``egress_proxy``, ``egress_conn``, ``egress_relay``,
  ``egress_wire``: a network allow-list (``Sandbox(network=[...])``): the
  listener a sandboxed worker makes in its network namespace and hands
  over; the filtering proxy that accepts on it in the supervisor (its
  gates, one per worker); one connection's handshake and decision; its
  relay both ways; the bytes it parses (HTTP requests and answers' ends,
  a TLS ClientHello's server name).
"""
