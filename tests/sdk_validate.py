"""Validate resources against the official ``sagemaker-hyperpod`` SDK's pydantic models.

Run with the interpreter of the venv that has the SDK (``.venv-sdk``, made by scripts/setup.sh;
the SDK pins its own versions and pulls in pytest plugins, so it stays out of ``.venv``).
Reads ``{"jobs": [spec, ...], "templates": [pod template, ...], "statuses": [status, ...]}`` as
JSON on stdin and prints ``{"errors": [[kind, index, message], ...], "sdk": version}``:

* ``jobs``: a HyperPodPyTorchJob ``spec`` -> ``_HyperPodPytorchJob.model_validate(spec,
  by_name=True)``; nested models forbid unknown fields, the top level ignores them, so its
  keys are checked against ``model_fields`` too;
* ``templates``: a pod template (e.g. of a Kubeflow PyTorchJob) -> the SDK's ``Template``;
* ``statuses``: a HyperPodPyTorchJob ``status`` (as the test's fake operator writes it) ->
  ``HyperPodPytorchJobStatus``.
"""

import json
import sys
import warnings
from importlib.metadata import version

warnings.filterwarnings("ignore")
from sagemaker.hyperpod.training.config import hyperpod_pytorch_job_unified_config as m  # noqa: E402

doc = json.load(sys.stdin)
errors = []
for kind, model, items in (("jobs", m._HyperPodPytorchJob, doc.get("jobs", [])),
                           ("templates", m.Template, doc.get("templates", [])),
                           ("statuses", m.HyperPodPytorchJobStatus, doc.get("statuses", []))):
    for i, obj in enumerate(items):
        try:
            model.model_validate(obj, by_name=True)
        except Exception as e:  # pydantic.ValidationError: report every field it names
            errors.append([kind, i, str(e)])
        unknown = sorted(set(obj) - set(model.model_fields))
        if unknown:
            errors.append([kind, i, f"unknown top-level keys {unknown}"])
print(json.dumps({"errors": errors, "sdk": version("sagemaker-hyperpod")}))
