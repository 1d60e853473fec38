/**
 * The only network code of the extension: the REST routes under `<base_url>hyperpod/`
 * and the job event WebSocket, both through `@jupyterlab/services`' ServerConnection
 * (so the token, XSRF header and base URL are those of the running Lab).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { HyperPodAPIError } from './errors';
import { IJobEvent } from './events';
import { FaultKind, IFaultInfo, IFaultRequest } from './faults';
import {
  IAdviceQuery,
  ICluster,
  IClusterDetail,
  IDiscoveredCluster,
  IDiscoverQuery,
  IDiscoverWritten,
  IEnvDiff,
  IEnvExport,
  IErrorBody,
  IGoodputAdvice,
  IJobSpec,
  IJobView,
  IMeasuredGoodput,
  ISubmitOptions,
  StreamMessage
} from './rest';

/** The URL namespace of the server extension. */
export const API_NAMESPACE = 'hyperpod';

/**
 * Call a route of the hyperpod API.
 *
 * @param path - route below `hyperpod/`, e.g. `jobs` or `jobs/ID/cancel` (may hold a query)
 * @param init - fetch options (method, body)
 * @param settings - server settings (default: the page's)
 * @returns the parsed JSON body
 * @throws {HyperPodAPIError} on a network failure (status 0) or a non-2xx answer
 */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new HyperPodAPIError(
      `cannot reach the Jupyter server: ${(error as Error).message}`,
      0,
      'NetworkError'
    );
  }
  const text = await response.text();
  let body: unknown = null;
  if (text.length > 0) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!response.ok) {
    const err = (body as IErrorBody | null)?.error;
    if (err && typeof err.message === 'string') {
      throw new HyperPodAPIError(
        err.message,
        response.status,
        err.type ?? 'Error',
        err.field ?? null
      );
    }
    throw new HyperPodAPIError(
      `${init.method ?? 'GET'} ${path} failed: HTTP ${response.status} ${response.statusText}`,
      response.status,
      'HTTPError'
    );
  }
  if (body === null && text.length > 0) {
    throw new HyperPodAPIError(
      `${path}: the server answered with something that is not JSON`,
      response.status,
      'BadResponse'
    );
  }
  return body as T;
}

const enc = encodeURIComponent;

/** The server this page talks to (its base URL): tabs of one server share state by it. */
export function serverScope(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  return settings.baseUrl;
}

/**
 * The configured cluster profiles.
 * @throws {HyperPodAPIError} when the server refuses or is unreachable
 */
export async function listClusters(): Promise<ICluster[]> {
  return (await requestAPI<{ clusters: ICluster[] }>('clusters')).clusters;
}

/**
 * A cluster's profile, reachability and nodes.
 * @throws {HyperPodAPIError} 404 for an unknown cluster
 */
export async function getCluster(name: string): Promise<IClusterDetail> {
  return requestAPI<IClusterDetail>(`clusters/${enc(name)}`);
}

/**
 * All jobs, newest first.
 * @throws {HyperPodAPIError} when the server refuses or is unreachable
 */
export async function listJobs(): Promise<IJobView[]> {
  return (await requestAPI<{ jobs: IJobView[] }>('jobs')).jobs;
}

/**
 * Submit a job. With `notebook` (a path under the server root) the notebook's code cells
 * are the training script.
 * `options.skipEnvCheck` submits without the environment check.
 * @throws {HyperPodAPIError} 400 (with `field`) for an invalid spec, 404 unknown cluster,
 *   409 `EnvironmentMismatch` (the cluster's hyperpod-lab is missing or incompatible),
 *   502 when the cluster cannot be reached
 */
export async function submitJob(
  spec: Partial<IJobSpec>,
  notebook: string | null = null,
  options: ISubmitOptions = {}
): Promise<IJobView> {
  const body: { spec: Partial<IJobSpec>; notebook?: string; skip_env_check?: boolean } = { spec };
  if (notebook) {
    body.notebook = notebook;
  }
  if (options.skipEnvCheck) {
    body.skip_env_check = true;
  }
  const res = await requestAPI<{ job: IJobView }>('jobs', {
    method: 'POST',
    body: JSON.stringify(body)
  });
  return res.job;
}

/**
 * Cancel a job.
 * @throws {HyperPodAPIError} 404 unknown job, 502 cluster unreachable
 */
export async function cancelJob(jobId: string): Promise<IJobView> {
  const res = await requestAPI<{ job: IJobView }>(`jobs/${enc(jobId)}/cancel`, {
    method: 'POST',
    body: '{}'
  });
  return res.job;
}
/**
 * Inject a fault of `kind` (default `kill`) into one rank of a running job, to rehearse recovery.
 * `factor` (only for `slow`, 1 to {@link MAX_SLOW_FACTOR}; the server's default 2 when omitted):
 * the rank's step time is multiplied by it.
 * @throws {HyperPodAPIError} 400 bad rank, kind (the message names the kinds) or factor, 403
 *   the scheduler refused (a Slurm node needs an operator), 409 the job, rank or backend cannot
 *   take it (e.g. `node` on the local backend), 404 unknown job
 */
export async function injectFault(
  jobId: string,
  rank: number,
  kind: FaultKind = 'kill',
  factor?: number
): Promise<IFaultInfo> {
  const body: IFaultRequest = { rank, kind };
  if (factor !== undefined) {
    body.factor = factor;
  }
  return requestAPI<IFaultInfo>(`jobs/${enc(jobId)}/faults`, {
    method: 'POST',
    body: JSON.stringify(body)
  });
}

/**
 * A job's log text; `rank` null for the scheduler's whole output.
 * @throws {HyperPodAPIError} 404 unknown job, 502 cluster unreachable
 */
export async function getLogs(
  jobId: string,
  rank: number | null
): Promise<string> {
  const q = rank === null ? '' : `?rank=${rank}`;
  return (
    await requestAPI<{ text: string }>(`jobs/${enc(jobId)}/logs${q}`)
  ).text;
}

/**
 * A page of a job's event history after `cursor`.
 * @throws {HyperPodAPIError} 404 unknown job
 */
export async function getEvents(
  jobId: string,
  cursor: string | null = null
): Promise<{ events: IJobEvent[]; cursor: string }> {
  const q = cursor ? `?cursor=${enc(cursor)}` : '';
  return requestAPI(`jobs/${enc(jobId)}/events${q}`);
}

/**
 * Open the live event stream of a job, resuming after `cursor` (all history when null).
 * `onMessage` receives each parsed message; malformed ones are dropped.
 *
 * @returns the WebSocket (close it to stop)
 */
export function openEventStream(
  jobId: string,
  cursor: string | null,
  onMessage: (msg: StreamMessage) => void,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): WebSocket {
  let url = URLExt.join(
    settings.wsUrl,
    API_NAMESPACE,
    'jobs',
    enc(jobId),
    'stream'
  );
  const query: string[] = [];
  if (cursor) {
    query.push(`cursor=${enc(cursor)}`);
  }
  if (settings.token) {
    query.push(`token=${enc(settings.token)}`);
  }
  if (query.length) {
    url += `?${query.join('&')}`;
  }
  const ws = new settings.WebSocket(url);
  ws.onmessage = (ev: MessageEvent) => {
    let msg: StreamMessage;
    try {
      msg = JSON.parse(String(ev.data)) as StreamMessage;
    } catch {
      return;
    }
    if (msg && typeof msg === 'object' && 'type' in msg) {
      onMessage(msg);
    }
  };
  return ws;
}

/**
 * The recommended checkpoint interval and projected goodput per recovery mode.
 * @throws {HyperPodAPIError} 400 (`field` names the input) for an input out of range or in the
 *   wrong unit
 */
export async function getGoodputAdvice(
  q: IAdviceQuery
): Promise<IGoodputAdvice> {
  const query =
    `instances=${enc(String(q.instances))}&failure_rate=${enc(q.failureRate)}` +
    `&checkpoint_cost_s=${enc(String(q.checkpointCostS))}&step_time_s=${enc(String(q.stepTimeS))}`;
  return (
    await requestAPI<{ advice: IGoodputAdvice }>(`goodput/advice?${query}`)
  ).advice;
}

/**
 * A job's measured goodput and where its lost time went, from its events so far.
 * @throws {HyperPodAPIError} 400 while the job has no step events, 404 unknown job
 */
export async function getJobGoodput(jobId: string): Promise<IMeasuredGoodput> {
  return (
    await requestAPI<{ measured: IMeasuredGoodput }>(`jobs/${enc(jobId)}/goodput`)
  ).measured;
}

/**
 * The HyperPod clusters of a region, described (the server calls the SageMaker API).
 * @throws {HyperPodAPIError} 400 without a usable region or credentials (the message says what
 *   to run), 502 when the API throttles or cannot be reached
 */
export async function discoverClusters(
  q: IDiscoverQuery
): Promise<IDiscoveredCluster[]> {
  const query: string[] = [];
  if (q.region) {
    query.push(`region=${enc(q.region)}`);
  }
  if (q.profile) {
    query.push(`profile=${enc(q.profile)}`);
  }
  const path = query.length ? `discover?${query.join('&')}` : 'discover';
  return (await requestAPI<{ clusters: IDiscoveredCluster[] }>(path)).clusters;
}

/**
 * Discover the clusters of a region and write a cluster profile for each (existing profiles
 * are kept unless `overwrite`).
 * @throws {HyperPodAPIError} as `discoverClusters`
 */
export async function writeDiscoveredProfiles(
  q: IDiscoverQuery,
  overwrite = false
): Promise<IDiscoverWritten> {
  const body: { region?: string; profile?: string; overwrite: boolean } = { overwrite };
  if (q.region) {
    body.region = q.region;
  }
  if (q.profile) {
    body.profile = q.profile;
  }
  return requestAPI<IDiscoverWritten>('discover', {
    method: 'POST',
    body: JSON.stringify(body)
  });
}

/**
 * The notebook's environment against the cluster interpreter's (Python, torch and its CUDA
 * build, hyperpod-lab, the packages `script` imports). One probe command on the cluster.
 *
 * @param cluster - the cluster profile
 * @param script - a script or notebook relative to the Lab root, or null for no package rows
 * @throws {HyperPodAPIError} 404 unknown cluster, 400 bad script, 502 cluster unreachable
 */
export async function getEnvDiff(cluster: string, script: string | null): Promise<IEnvDiff> {
  const q = script ? `?script=${enc(script)}` : '';
  return requestAPI<IEnvDiff>(`clusters/${enc(cluster)}/env${q}`);
}

/**
 * Write the notebook's pinned requirements to the cluster's shared storage.
 *
 * @param cluster - the cluster profile
 * @param name - the environment's name (letters, digits, `.`, `_`, `-`)
 * @returns the file's path and the command that builds the environment there
 * @throws {HyperPodAPIError} 400 bad name, 404 unknown cluster, 409 EKS, 502 unreachable
 */
export async function exportEnv(cluster: string, name = 'notebook'): Promise<IEnvExport> {
  return requestAPI<IEnvExport>(`clusters/${enc(cluster)}/env/export`, {
    method: 'POST',
    body: JSON.stringify({ name })
  });
}
