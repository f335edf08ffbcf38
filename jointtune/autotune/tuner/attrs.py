"""The names our tuning data goes by in Optuna's storage: trial user attrs (`ATTR_*`) and study user attrs (`STUDY_*`).

A module of its own, so that what reads a study (`studies`) and what judges its finalists (`finalists`) share them
without importing each other. `studies` says what each trial state and attr means.
"""

from __future__ import annotations

ATTR_REASON = "fail_reason"
ATTR_DETAIL = "fail_detail"
ATTR_CONFIG = "jt_config"
ATTR_OWNER = "jt_owner"
ATTR_DEADLINE = "jt_deadline"
ATTR_ROLE = "jt_role"
ATTR_CACHED = "jt_cached"
ATTR_RETRY_OF = "jt_retry_of"
ATTR_PRIOR = "jt_prior"
ATTR_MOVED = "jt_moved"
ATTR_REFUSED = "jt_refused"
ATTR_P10, ATTR_P50, ATTR_P90 = "p10_us", "p50_us", "p90_us"
#: host time (µs) to launch one call: what an eager caller pays per call even when the GPU is idle
ATTR_HOST = "host_us"
#: study user attrs
STUDY_JOB, STUDY_KEY, STUDY_SPACE, STUDY_BASELINE = "jt_job", "jt_key", "jt_space", "jt_baseline"
STUDY_INIT, STUDY_STOPPED = "jt_init", "jt_stopped"
#: study user attrs: why the search stopped, in words (beside the reason code in STUDY_STOPPED); the priors the
#: start holds (their sources, as the trials note them)
STUDY_STOP_DETAIL, STUDY_PRIORS = "jt_stop_detail", "jt_priors"
#: study user attr: the final round, the finalists timed again side by side (`finalists.FinalRound`)
STUDY_FINAL = "jt_final"
