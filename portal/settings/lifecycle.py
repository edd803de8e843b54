"""The labs' settings: the cluster, attempt lifecycle timings, warm pools, grading, consoles and health probes."""

from __future__ import annotations

from pathlib import Path

from portal.settings.base import VAR_DIR
from portal.settings.env import env_int, env_str

# Cluster access: in-cluster config, then KUBECONFIG, then the embedded kubesim's kubeconfig.
KUBECONFIG = env_str("KUBECONFIG")
KUBE_CONTEXT = env_str("KUBE_CONTEXT")
EMBEDDED_KUBECONFIG = VAR_DIR / "kubesim" / "kubeconfig"

# Attempt lifecycle timings (seconds unless named otherwise).
ATTEMPT_SYNC_INTERVAL_SECONDS = env_int("ATTEMPT_SYNC_INTERVAL_SECONDS", 3)
ATTEMPT_SWEEP_INTERVAL_SECONDS = env_int("ATTEMPT_SWEEP_INTERVAL_SECONDS", 60)
ATTEMPT_START_TIMEOUT_SECONDS = env_int("ATTEMPT_START_TIMEOUT_SECONDS", 600)
ATTEMPT_SLOW_START_NOTICE_SECONDS = env_int("ATTEMPT_SLOW_START_NOTICE_SECONDS", 90)
ATTEMPT_EXTEND_MINUTES = env_int("ATTEMPT_EXTEND_MINUTES", 15)
ATTEMPT_MAX_EXTENSIONS = env_int("ATTEMPT_MAX_EXTENSIONS", 2)
# Namespaces whose attempts are all steady (running) are listed this often; others on every sync.
ATTEMPT_RESYNC_SECONDS = env_int("ATTEMPT_RESYNC_SECONDS", 30)
# How long a VM may stay unable to pull its image (or be otherwise held) before the attempt fails with that reason.
ATTEMPT_FAILURE_GRACE_SECONDS = env_int("ATTEMPT_FAILURE_GRACE_SECONDS", 30)
# How long a VM may wait for a node with room (an autoscaler takes minutes); below ATTEMPT_START_TIMEOUT_SECONDS.
ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS = env_int("ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS", 300)
# Starts in flight across the deployment before new ones are asked to retry (JupyterHub's concurrent_spawn_limit).
ATTEMPT_CONCURRENT_START_LIMIT = env_int("ATTEMPT_CONCURRENT_START_LIMIT", 100)
# After creating a VM its namespace is listed again at these delays, so a quick start is seen before the next sync.
ATTEMPT_FOLLOW_UP_SECONDS = (0.05, 0.3, 1.0, 2.5)
ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS = env_int("ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS", 60)
KUBEVIRT_NAMESPACE = env_str("KUBEVIRT_NAMESPACE", "kubevirt")
# The portal's own namespace when it runs in the cluster (its pods may then reach the agent port too).
PORTAL_NAMESPACE = env_str("PORTAL_NAMESPACE")
# Warm pools (labs.services.pools): a pass every POOL_PASS_SECONDS makes at most POOL_REFILL_PER_PASS VMs per pool.
POOL_PASS_SECONDS = env_int("POOL_PASS_SECONDS", 5)
POOL_REFILL_PER_PASS = env_int("POOL_REFILL_PER_PASS", 5)
# Booting pool VMs' agents are asked every pass, ready ones only this often (a claim asks the agent anyway).
POOL_READY_CHECK_SECONDS = env_int("POOL_READY_CHECK_SECONDS", 30)
# A pool's refill waits while its class is arriving (within POOL_REFILL_HOLD_SECONDS of its latest claim), for at
# most POOL_REFILL_HOLD_MAX_SECONDS after the first claim since its last refill. 0: no hold.
POOL_REFILL_HOLD_SECONDS = env_int("POOL_REFILL_HOLD_SECONDS", 5)
POOL_REFILL_HOLD_MAX_SECONDS = 6 * POOL_REFILL_HOLD_SECONDS
# Claimed and deleted pool VM rows are pruned this many days after they ended, their figures kept on the pool.
POOL_VM_RETENTION_DAYS = env_int("POOL_VM_RETENTION_DAYS", 30)
GRADING_MIN_INTERVAL_SECONDS = env_int("GRADING_MIN_INTERVAL_SECONDS", 10)
# A grading run no worker picked up within this long is failed (a regrade: at least twice the task time limit).
GRADING_QUEUED_STALE_SECONDS = 300
# How long one check's output pattern may take to match (labs.patterns); past it the check fails, saying why.
GRADING_PATTERN_TIMEOUT_MS = env_int("GRADING_PATTERN_TIMEOUT_MS", 1000)
AGENT_PORT = 8787

CONSOLE_SCROLLBACK_BYTES = env_int("CONSOLE_SCROLLBACK_BYTES", 64 * 1024)
# Output sent to a browser but not yet acknowledged as drawn; past it the viewer is lagging (labs.console.flow).
CONSOLE_OUTPUT_WINDOW_BYTES = 1024 * 1024
CONSOLE_LAG_CLOSE_SECONDS = 60.0
CONSOLE_INPUT_FRAME_MAX_BYTES = 16 * 1024
CONSOLE_INPUT_RATE_BYTES_PER_SECOND = 32 * 1024
CONSOLE_INPUT_BURST_BYTES = 64 * 1024
CONSOLE_LEASE_TTL_SECONDS = 6.0
CONSOLE_UPSTREAM_RETRY_SECONDS = 1.0
CONSOLE_UPSTREAM_MAX_BACKOFF_SECONDS = 5.0
CONSOLE_UPSTREAM_MAX_MESSAGE_BYTES = 1024 * 1024
CONSOLE_RECORDING_MAX_BYTES = 32 * 1024 * 1024
CONSOLE_RECORDING_FLUSH_SECONDS = 0.5
# Connections one process's consoles share: each command is one short round trip, so a few dozen carry hundreds.
CONSOLE_REDIS_MAX_CONNECTIONS = 64
CONSOLE_RECORDINGS_DIR = Path(env_str("CONSOLE_RECORDINGS_DIR", str(VAR_DIR / "recordings")))

# /metrics accepts `Authorization: Bearer $METRICS_TOKEN` when the token is set, and a staff session always.
METRICS_TOKEN = env_str("METRICS_TOKEN")
HEALTH_CLUSTER_TIMEOUT_SECONDS = env_int("HEALTH_CLUSTER_TIMEOUT_SECONDS", 2)
HEALTH_CLUSTER_CACHE_SECONDS = env_int("HEALTH_CLUSTER_CACHE_SECONDS", 5)
HEALTH_SYNC_MAX_AGE_SECONDS = env_int("HEALTH_SYNC_MAX_AGE_SECONDS", max(60, 10 * ATTEMPT_SYNC_INTERVAL_SECONDS))
