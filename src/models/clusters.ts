/** The cluster profiles and each one's reachability and nodes. */
import * as api from '../api/network';
import { ICluster, IClusterDetail } from '../api/rest';
import { IClustersModel } from './tokens';
import { ServerStateModel } from './serverState';

/**
 * Cluster profiles (`GET hyperpod/clusters`) and their health (`GET hyperpod/clusters/{name}`);
 * `changed` when either changed, `error` when the list could not be read.
 */
export class ClustersModel extends ServerStateModel implements IClustersModel {
  /** Cluster profiles, as the server lists them. */
  get clusters(): ICluster[] {
    return this._clusters;
  }
  /** Health of each cluster by name (filled in by `refresh`). */
  get details(): ReadonlyMap<string, IClusterDetail> {
    return this._details;
  }

  /**
   * Reload the list, then each cluster's health (a cluster that cannot be asked is listed as
   * `unreachable` with the reason). Never throws: a failed list lands in `error`.
   */
  async refresh(): Promise<void> {
    try {
      this._clusters = await api.listClusters();
      this._setError(null);
    } catch (e) {
      this._setError((e as Error).message);
      return;
    }
    this._changed.emit();
    await Promise.all(
      this._clusters.map(async c => {
        try {
          this._details.set(c.name, await api.getCluster(c.name));
        } catch (e) {
          this._details.set(c.name, {
            cluster: c,
            state: 'unreachable',
            error: (e as Error).message,
            nodes: []
          });
        }
        this._changed.emit();
      })
    );
  }

  private _clusters: ICluster[] = [];
  private _details = new Map<string, IClusterDetail>();
}
