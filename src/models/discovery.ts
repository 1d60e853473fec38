/** Discovery of the HyperPod clusters of an AWS region, and writing their profiles. */
import { ISignal, Signal } from '@lumino/signaling';

import * as api from '../api/network';
import { IDiscoveredCluster, IDiscoverQuery } from '../api/rest';
import { IClustersModel, IDiscoveryModel } from './tokens';
import { LatestRequest } from './latest';

/** `GET discover` / `POST discover` (the server calls the SageMaker API); the newest call wins. */
export class DiscoveryModel implements IDiscoveryModel {
  /** @param _clusters - reloaded after profiles were written */
  constructor(private readonly _clusters: IClustersModel) {}

  /** The query and the clusters of the last discovery, or null before one (and after an error). */
  get discovered(): { query: IDiscoverQuery; clusters: IDiscoveredCluster[] } | null {
    return this._discovered;
  }
  /** Why the last discovery or profile write failed (the server's message), or null. */
  get error(): string | null {
    return this._error;
  }
  /** `listing` or `writing` while a request runs, else null. */
  get busy(): 'listing' | 'writing' | null {
    return this._busy;
  }
  /** The profiles the last "add profiles" wrote or kept, or null. */
  get written(): { name: string; what: string }[] | null {
    return this._written;
  }
  /** The result, error, busy state or written profiles changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * List the HyperPod clusters of `query.region`. The result or the error lands in
   * `discovered` / `error`; never throws.
   */
  async discover(query: IDiscoverQuery): Promise<void> {
    const outcome = await this._run('listing', () => api.discoverClusters(query));
    if (outcome === null) {
      return;
    }
    this._discovered = outcome.ok ? { query, clusters: outcome.value } : null;
    this._settle(outcome.ok ? null : outcome.error.message);
  }

  /** List the clusters of the last discovery's query again, if there was one and none runs. */
  async rediscover(): Promise<void> {
    if (this._discovered && this._busy === null) {
      await this.discover(this._discovered.query);
    }
  }

  /**
   * Write a cluster profile for each cluster of the last discovery's region (existing ones
   * are kept), then reload the cluster list. Never throws: errors land in `error`.
   */
  async addProfiles(): Promise<void> {
    const query = this._discovered?.query;
    if (!query) {
      this._error = 'discover the clusters of a region first';
      this._changed.emit();
      return;
    }
    const outcome = await this._run('writing', () => api.writeDiscoveredProfiles(query));
    if (outcome === null) {
      return;
    }
    if (outcome.ok) {
      this._discovered = { query, clusters: outcome.value.clusters };
      this._written = outcome.value.written;
    }
    this._settle(outcome.ok ? null : outcome.error.message);
    if (outcome.ok) {
      await this._clusters.refresh();
    }
  }

  /** Disconnect the listeners; answers still to come are dropped. */
  dispose(): void {
    this._disposed = true;
    this._latest.cancel();
    Signal.clearData(this);
  }

  /** Run `request` as the latest, with `busy` set meanwhile; null when superseded or disposed. */
  private async _run<T>(busy: 'listing' | 'writing', request: () => Promise<T>) {
    this._busy = busy;
    this._error = null;
    this._written = null;
    this._changed.emit();
    const outcome = await this._latest.run(request);
    return this._disposed ? null : outcome;
  }

  private _settle(error: string | null): void {
    this._error = error;
    this._busy = null;
    this._changed.emit();
  }

  private _latest = new LatestRequest();
  private _disposed = false;
  private _discovered: { query: IDiscoverQuery; clusters: IDiscoveredCluster[] } | null = null;
  private _error: string | null = null;
  private _busy: 'listing' | 'writing' | null = null;
  private _written: { name: string; what: string }[] | null = null;
  private _changed = new Signal<this, void>(this);
}
