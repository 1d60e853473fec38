"""REST routes of environment parity (``hyperpod_lab.submit.envparity``; contract in ``docs/openapi.yaml``).

* ``GET hyperpod/clusters/<name>/env?script=PATH``: the notebook's environment (this server's
  interpreter, the one its kernels and CLI run in) against the cluster interpreter's:
  ``{"cluster", "python", "script", "supported": true, "summary": "ok" | "warning" | "error",
  "differences": [{"item", "local", "remote", "severity", "message"}], "local", "remote"}``.
  ``script`` (optional) is relative to the Jupyter root directory; a notebook (``.ipynb``) is
  read through its code cells as a submission would. An EKS cluster answers ``{"supported":
  false, "message"}``.
* ``POST hyperpod/clusters/<name>/env/export`` ``{"name": "notebook"}``: writes the notebook's
  pinned requirements to ``<shared_root>/hyperpod-lab/<user>/envs/<name>/requirements.txt`` on the
  cluster and answers ``{"cluster", "name", "path", "venv", "python", "command", "pins"}``
  (``command`` builds the environment there). EKS: 409.

Unknown cluster: 404 naming it; a bad script path or name: 400. The probe (one command over
the cluster's SSH route) and the write run on the cluster's own worker (``Watcher.run_on``).
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from hyperpod_lab.errors import SpecError
from hyperpod_lab.server.handlers.base import HyperPodHandler, error_body
from hyperpod_lab.submit import envparity
from hyperpod_lab.submit.clusters import get_profile
from hyperpod_lab.submit.notebook_script import inside


def _diff(client, profile, script: str | None) -> dict:
    return envparity.env_diff(profile, script, remote=client.scheduler(profile.name).remote)


class EnvDiffHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, name: str):
        profile = get_profile(name)
        rel = self.get_query_argument("script", None)
        script = inside(self.hp.root_dir, rel, "script") if rel else None
        if profile.orchestrator == "eks":
            try:
                envparity.probe_cluster(profile)
            except envparity.EnvCheckUnsupported as e:
                return self.reply({"cluster": name, "python": profile.python, "script": rel, "supported": False,
                                   "message": str(e)})
        report = await self.hp.watcher.run_on(name, _diff, self.hp.client, profile, script)
        report["script"] = rel
        self.reply({**report, "supported": True})


class EnvExportHandler(HyperPodHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, name: str):
        profile = get_profile(name)
        body = self.json_body()
        if not isinstance(body, dict):
            raise SpecError("body", 'send {"name": "notebook"} (name optional)')
        unknown = set(body) - {"name"}
        if unknown:
            raise SpecError(sorted(unknown)[0], "unknown request field; send only 'name'")
        env_name = body.get("name", envparity.DEFAULT_ENV_NAME)
        try:
            if profile.orchestrator == "eks":
                envparity.export(profile, env_name)
        except envparity.EnvCheckUnsupported as e:
            return self.reply(error_body(e), status=409)
        envparity.check_env_name(env_name)  # a bad name: 400 before anything is contacted
        res = await self.hp.watcher.run_on(
            name, lambda: envparity.export(profile, env_name, remote=self.hp.client.scheduler(name).remote))
        self.reply(res)
