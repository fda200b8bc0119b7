"""The supervisor's I/O side: one thread per queue that starts, watches and
reaps the workers, and the channels through which it reaches them.

Imports ``procq._core`` (through ``Core``'s methods), ``procq._worker`` (what a
trusted worker runs), ``procq._system``, ``procq._wire`` and ``procq._model``;
never the API above it.

- ``loop``: the I/O thread's loop, with a diagram of who owns what and what
  each pipe carries.
- ``start``: what it starts, and the starter thread that starts worker
  processes off it. ``wait``: what it waits on (one selector), its timers and
  its last wait for workers. ``end``: how it stops. ``lead``: handing a pipe
  between the I/O thread and waiters.
- ``decode``: the lanes' decode threads. ``failures``: how it words the
  failures it gives jobs. ``log``: what it logs as it decides (the
  ``procq.worker`` and ``procq.job`` loggers, silent by default).
- ``channels``: the registry of worker kinds (``KINDS``, ``channel_kind``)
  and ``ProcessChannel``, what the local kinds share; ``channel_trusted`` and
  ``channel_untrusted``: the two local kinds. ``egress``: a lane's network
  allow-list as its untrusted channel uses it (the lane's proxy, a gate per
  worker, what a refused job's outcome says). ``output``: the relay of
  what an untrusted lane's workers and jobs print (pipes, never the
  supervisor's own terminal).
- ``undertaker``: the small process per queue that kills the workers'
  process groups should the supervisor's process die.
"""
