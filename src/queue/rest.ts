/**
 * The REST shapes of the "Cluster queue" panel: `GET hyperpod/clusters/<name>/queue`
 * (`docs/openapi.yaml`, `QueueView`; Python: `hyperpod_lab/server/queue.py` and
 * `hyperpod_lab/schedulers/slurm.py`'s `parse_queue`/`parse_nodes`).
 */
import { requestAPI } from '../api/network';
import { ICluster } from '../api/rest';

/** One row of squeue (squeue(1) `-P`: a pending job once per partition it may run in). */
export interface IQueueJob {
  /** Slurm job id as squeue's `%i` prints it (`123`, an array task `123_4`). */
  id: string;
  /** squeue's `%T`, e.g. `PENDING`, `RUNNING`, `COMPLETING`. */
  state: string;
  /** hyperpod-lab's status of that state: `pending`, `running`, ... */
  status: string;
  /** Partition (`%P`). */
  partition: string;
  /** Priority (`%Q`), or null. */
  priority: number | null;
  /** Nodes allocated, or wanted by a pending job (`%D`), or null. */
  nodes: number | null;
  /** Unix user (`%u`): another user's text, render as text. */
  user: string;
  /** Time used (`%M`, `[days-][hours:]minutes:seconds`). */
  time: string;
  /** Time limit (`%l`), `UNLIMITED` or `NOT_SET`. */
  time_limit: string;
  /** Actual or expected start (`%S`, ISO local time), or null. */
  start: string | null;
  /** Allocated nodes (`%N`), or null. */
  nodelist: string | null;
  /** Why the job is in its state (`%r`), or null (`None`). */
  reason: string | null;
  /** Job name (`%j`): another user's free text (may hold `|`, newlines, markup); render as text. */
  name: string;
  /** A pending row's 1-based place among the pending rows of its partition, in scheduling order; else null. */
  position: number | null;
  /** The login user's job, or one of ours. */
  mine: boolean;
  /** The hyperpod-lab job id of one of ours, else null. */
  job_id: string | null;
}

/** One node (sinfo `-N`), merged over its partitions. */
export interface IQueueNode {
  /** Node name (`%N`). */
  name: string;
  /** sinfo's extended state (`%T`, flag suffix kept: `down*`, `idle~`). */
  state: string;
  /** `idle`, `alloc`, `mixed`, `down`, `drain` or `other`. */
  group: string;
  /** CPUs of the node (`%c`), or null. */
  cpus: number | null;
  /** CPUs allocated and idle (`%C`), or null. */
  cpus_alloc: number | null;
  cpus_idle: number | null;
  /** Generic resources (`%G`), or null. */
  gres: string | null;
  /** Why the node is down, drained or draining (`%E`): an operator's free text; or null. */
  reason: string | null;
  /** When that reason was set (`%H`), or null. */
  reason_time: string | null;
  /** Partitions the node belongs to. */
  partitions: string[];
}

/** One partition. */
export interface IQueuePartition {
  name: string;
  /** The cluster's default partition (`*` of `%P`). */
  default: boolean;
  /** `up`, `down`, `drain`, `inact` (`%a`). */
  avail: string;
  /** Longest job (`%l`). */
  time_limit: string;
  /** Its node names. */
  nodes: string[];
  /** Its nodes per group. */
  counts: { [group: string]: number };
}

/** The answer of `GET hyperpod/clusters/<name>/queue`. */
export interface IQueueView {
  cluster: string;
  /** false: the cluster has no queue view (local, EKS): `message` says so and the lists are empty. */
  supported: boolean;
  message: string | null;
  /** When the snapshot was taken, s since the epoch. */
  fetched_at: number;
  /** Its age when answered, s. */
  age_s: number;
  /** Seconds between two snapshots (shared by every tab). */
  interval_s: number;
  /** The login user, or null. */
  user: string | null;
  jobs: IQueueJob[];
  nodes: IQueueNode[];
  partitions: IQueuePartition[];
  /** Nodes per group. */
  counts: { [group: string]: number };
}

/**
 * The queue view of `cluster`.
 *
 * @throws {HyperPodAPIError} 404 unknown cluster, 502 login node unreachable or squeue/sinfo failed
 */
export function fetchQueue(cluster: string): Promise<IQueueView> {
  return requestAPI<IQueueView>(`clusters/${encodeURIComponent(cluster)}/queue`);
}

/**
 * The cluster profiles (`GET hyperpod/clusters`).
 *
 * @throws {HyperPodAPIError} when the server cannot be reached
 */
export async function fetchClusters(): Promise<ICluster[]> {
  return (await requestAPI<{ clusters: ICluster[] }>('clusters')).clusters;
}
