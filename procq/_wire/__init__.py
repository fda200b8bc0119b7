"""What crosses a pipe or a database row, and what is safe to read from it.

Shared by the supervisor's side and the workers' side; imports only
``procq._model``.

- ``protocol``: what travels on a worker's pipe, framed, and the typed events
  it decodes to.
- ``main_ref``: a main script's function sent to a lane with an
  initializer, by name, so that it shares the worker's main module.
  ``main_by_value``: when what the main module defines crosses by value (a
  notebook, the REPL, ``python -c``, stdin, a zipapp; untrusted and remote lanes).
- ``plain``: which pickles unpickle without running code.
- ``oob``: a trusted job's large buffers (arguments and results) out of the
  pickle (protocol 5). ``shm``: the shared-memory segments they travel in,
  and who removes each one. ``shm_results``: the segments a trusted worker
  writes large results into, kept and written again once the supervisor is
  done with them.
- ``json_keys``: an untrusted job's result, checked for non-``str`` dict keys.
- ``fingerprint``: what a claim remembers of its payload, to catch a key
  reused for other work.
- ``startmark``: the word of shared memory in which a worker says which job
  it starts, read by the supervisor when the worker dies.
"""
