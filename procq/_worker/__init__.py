"""The worker processes: what runs in a child, never in the supervisor.

Imports only ``procq._wire``, ``procq._system`` and ``procq._model``: nothing
of the supervisor, the core or the API, so that a worker starts with as little
as it can.

- ``trusted``: a trusted worker's loop, and what both kinds of worker share.
- ``parent``: how a trusted worker follows its supervisor's life.
- ``limits``: a trusted worker's per-job limits (memory, CPU time).
- ``untrusted``: a clean interpreter that forks a confined process per job;
  ``relay``: how it passes on what a job's process writes.
- ``sandbox``: a sandboxed worker's side: it enters its namespaces once and
  confines each job's process, then reaps what the job left.
- ``forkserver_guard``: imported only by the forkserver procq starts, to make
  it untraceable and fork only for its parent; ``forkserver_main``: imported
  there too, to import the program's main module once, in the server.
- ``initializer``: a lane's initializer as a worker's start carries it, and
  ``InitializerFailed``; loaded in a worker only when its lane has one.
- ``template``: a trusted lane's template, the booted process its
  replacements and spares fork from, which reaps them and reports their exits.
- ``warm``: learned warm starts: the modules a lane's jobs needed, reported
  by its workers and imported by its template.
- ``unguarded``: a queue opened while a worker imports the main module (no
  ``if __name__ == "__main__":`` guard): the worker exits with a code of
  its own, the supervisor says what to do.
- ``thread_limits``: native libraries' thread pools limited with
  ``threadpoolctl`` (the joblib backend's ``inner_max_num_threads``).
"""
