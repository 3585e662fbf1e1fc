"""``gpustation doctor``: whether this machine is ready to train, and why not
(:mod:`.checks`), and a support bundle (:mod:`.bundle`). Read only: nothing
here changes a GPU setting."""
