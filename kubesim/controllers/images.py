"""kubelet pulling a containerDisk image that does not exist, and virt-controller reporting it on the VMI.

kubelet alternates: a pull fails (the container waits with ErrImagePull), then it backs off (ImagePullBackOff,
"Back-off pulling image …") for 10 s doubling to 300 s, then pulls again. virt-controller copies the waiting
container's reason and message into ``Synchronized=False`` (``checkForContainerImageError``,
``pkg/virt-controller/watch/vmi/lifecycle.go``), and because the reason changes at each flip the condition is
removed and added again with a new ``lastTransitionTime`` (``CheckFailure``, ``pkg/controller/conditions.go``).
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers.objects import (
    POD,
    VMI,
    VmiRuntime,
    drop_condition,
    get_condition,
    new_condition,
    set_condition,
)

MAX_BACKOFF = 300.0
# How long after a failed pull kubelet's next sync reports the back-off.
BACKOFF_REPORTED_AFTER = 1.0


class ImagePullController:
    """Mixed into ``Cluster``."""

    def _image_pull_failure(self, vmi: dict[str, Any], runtime: VmiRuntime, pod: dict[str, Any], image: str) -> None:
        """One step of the pull / back-off cycle; requeues itself for the next."""
        now = self.loop.time()
        if runtime.image_next_at is not None and now < runtime.image_next_at:
            self.enqueue_later(runtime.image_next_at - now, "vmi", runtime.namespace, runtime.name)
            return
        node = runtime.node or ""
        error = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
            f'failed to resolve reference "{image}": {image}: not found'
        )
        if runtime.image_backing_off or runtime.image_pulls == 0:
            runtime.image_backing_off = False
            runtime.image_pulls += 1
            reason, message = "ErrImagePull", error
            self.record(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
            self.record(pod, "Warning", "Failed", f'Failed to pull image "{image}": {error}', "kubelet", node)
            self.record(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
            runtime.image_next_at = now + BACKOFF_REPORTED_AFTER
        else:
            runtime.image_backing_off = True
            reason, message = "ImagePullBackOff", f'Back-off pulling image "{image}": ErrImagePull: {error}'
            self.record(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet", node)
            self.record(pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", node)
            backoff = min(MAX_BACKOFF, self.config.image_pull_backoff * 2 ** (runtime.image_pulls - 1))
            runtime.image_next_at = now + max(backoff, BACKOFF_REPORTED_AFTER)
        container = next((c["name"] for c in pod["spec"]["containers"] if c.get("image") == image), "compute")

        def waiting(o: dict[str, Any]) -> None:
            o["status"]["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "waiting": {"reason": reason, "message": message}
                        if c["name"] == container
                        else {"reason": "PodInitializing"}
                    },
                }
                for c in o["spec"]["containers"]
            ]

        self.api.mutate(POD, runtime.namespace, pod["metadata"]["name"], waiting)

        def not_synced(o: dict[str, Any]) -> None:
            if (get_condition(o, "Synchronized") or {}).get("reason") != reason:
                drop_condition(o, "Synchronized")  # CheckFailure: a new reason is a new condition
            set_condition(o, new_condition("Synchronized", "False", reason, message))

        self.api.mutate(VMI, runtime.namespace, runtime.name, not_synced)
        self.enqueue_later(runtime.image_next_at - now, "vmi", runtime.namespace, runtime.name)
