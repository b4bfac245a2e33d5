"""The driver loader: kernel modules, nouveau, device nodes, persistence, readiness, and safe upgrades.

One concern per module:

- ``settings``: the typed settings of each verb (flags, NVIDIA's env vars); ``cli``: the verbs' specs;
  ``commands``: what each verb prints and its exit code;
- ``config``: the loader's configuration from the settings and the host; ``modules``: the pure plan
  (module types, parameters, digest, what ``init`` does); ``observe``: what the host shows before planning;
- ``loader``: ``init``/``unload`` step by step; ``steps``: step events and the status book;
  ``daemon``: the health daemon; ``readiness``: the files others read; ``kmod``/``devnodes``: host
  operations and device nodes; ``ops``: the seam the driver manager uses;
- ``upgrade``: the driver manager's flow; ``upgrade_state``: its pure parts; ``eviction``: evicting pods.
"""
