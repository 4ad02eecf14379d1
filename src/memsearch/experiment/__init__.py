"""``memsearch experiment run``: one command on a GPU node (or this CPU), from data download to a
trained, deployed and compared memory policy, its model servers started and always stopped
(docs/server.md). ``config`` is the settings file, ``stages`` the stages of its own (download,
models, baseline, deployment), ``run`` the orchestration and its record (``run.json``)."""
