/**
 * "Discover HyperPod clusters": region and AWS profile inputs, the clusters the SageMaker API
 * lists for them (orchestrator, status, instance groups, node health), and "Add profiles",
 * which writes a cluster profile per cluster and reloads the sidebar's cluster list.
 */
import { IDiscoveredCluster } from '../api/rest';
import { IDiscoveryModel } from '../models/tokens';
import { button, errorBox, h, labelledList, liveBox, textInput, uid } from './dom';

/** One word of a status for a CSS modifier: `InService` → `inservice`. */
function mod(status: string): string {
  return status.replace(/[^a-z]/gi, '').toLowerCase();
}

/** `workers: ml.c5.xlarge 2/2` (current/target instances). */
export function describeGroups(c: IDiscoveredCluster): string {
  return (c.instance_groups ?? [])
    .map(g => `${g.name}: ${g.instance_type} ${g.current_count}/${g.target_count}`)
    .join(', ');
}

/** `Running 2, Pending 1`, or `no nodes`. */
export function describeHealth(c: IDiscoveredCluster): string {
  const parts = Object.entries(c.node_health ?? {}).map(([s, n]) => `${s} ${n}`);
  return parts.length ? parts.join(', ') : 'no nodes';
}

/**
 * The discovery form and its results. The DOM node is plain (no Lumino messages needed):
 * the sidebar places it inside a `<details>`. It renders the discovery model's state and
 * re-renders on its `changed`.
 */
export class DiscoverPanel {
  /** @param model - the discovery state it renders and calls */
  constructor(model: IDiscoveryModel) {
    this._model = model;
    const regionId = uid('hp-discover-region');
    const profileId = uid('hp-discover-profile');
    this._region = textInput(regionId, 'us-west-2', 'hp-discover-region');
    this._profile = textInput(profileId, 'default credentials', 'hp-discover-profile');
    this._discoverButton = button('hp-discover-button', 'Discover', { type: 'submit' });
    this._addButton = button('hp-discover-add', 'Add profiles', {
      class: 'jp-HyperPod-button jp-mod-accept',
      title: 'Write a cluster profile for each cluster listed (existing profiles are kept)',
      disabled: true
    });
    this._status = liveBox('jp-HyperPod-dim', 'hp-discover-status');
    this._error = errorBox('hp-discover-error');
    this._list = labelledList('ul', 'jp-HyperPod-discoverList', 'hp-discovered', 'Discovered HyperPod clusters');
    this._written = labelledList('ul', 'jp-HyperPod-discoverWritten', 'hp-discover-written', 'Profiles written', {
      hidden: true
    });
    const form = h(
      'form',
      {
        class: 'jp-HyperPod-discoverForm',
        'data-testid': 'hp-discover-form',
        'aria-label': 'Discover HyperPod clusters'
      },
      h(
        'div',
        { class: 'jp-HyperPod-field' },
        h('label', { for: regionId }, 'AWS region'),
        this._region
      ),
      h(
        'div',
        { class: 'jp-HyperPod-field' },
        h('label', { for: profileId }, 'AWS profile'),
        this._profile,
        h('span', { class: 'jp-HyperPod-hint' }, 'optional')
      ),
      h('div', { class: 'jp-HyperPod-controls' }, this._discoverButton, this._addButton)
    );
    // Enter in either input submits the form: Discover
    form.addEventListener('submit', ev => {
      ev.preventDefault();
      void this.discover();
    });
    this._addButton.addEventListener('click', () => {
      void this._model.addProfiles();
    });
    this.node = h(
      'div',
      { class: 'jp-HyperPod-discover', 'data-testid': 'hp-discover' },
      form,
      this._status,
      this._error,
      this._list,
      this._written
    );
    this._model.changed.connect(this._render, this);
    this._render();
  }

  /** The panel's DOM node. */
  readonly node: HTMLDivElement;

  /** List the clusters of the region and profile typed in. */
  async discover(): Promise<void> {
    await this._model.discover({
      region: this._region.value.trim(),
      profile: this._profile.value.trim()
    });
  }

  /** Focus the region input. */
  focusFirst(): void {
    this._region.focus();
  }

  private _render(): void {
    const model = this._model;
    const busy = model.busy;
    const found = model.discovered;
    this.node.setAttribute('aria-busy', busy ? 'true' : 'false');
    this._discoverButton.disabled = busy !== null;
    this._addButton.disabled = busy !== null || !found || found.clusters.length === 0;

    const err = model.error;
    this._error.hidden = err === null;
    this._error.textContent = err ?? '';

    const where = (region: string) => (region ? `region ${region}` : 'the default region');
    if (busy === 'listing') {
      this._status.textContent = 'Asking the SageMaker API…';
    } else if (busy === 'writing') {
      this._status.textContent = 'Writing cluster profiles…';
    } else if (found) {
      const n = found.clusters.length;
      this._status.textContent =
        n === 0
          ? `No HyperPod clusters in ${where(found.query.region)}; try another region.`
          : `${n} HyperPod cluster${n === 1 ? '' : 's'} in ${where(found.query.region)}`;
    } else {
      this._status.textContent = '';
    }

    this._list.textContent = '';
    for (const c of found?.clusters ?? []) {
      this._list.appendChild(
        h(
          'li',
          {
            class: 'jp-HyperPod-discovered',
            'data-testid': 'hp-discovered-cluster',
            'data-cluster': c.name,
            'data-status': c.status
          },
          h('span', { class: 'jp-HyperPod-name' }, c.name),
          ' ',
          h('span', { class: 'jp-HyperPod-dim' }, c.orchestrator),
          ' ',
          h('span', { class: `jp-HyperPod-state jp-mod-${mod(c.status)}`, 'data-testid': 'hp-discovered-status' }, c.status),
          h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-discovered-groups' }, `Instance groups (current/target): ${describeGroups(c) || 'none'}`),
          h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-discovered-health' }, `Node health: ${describeHealth(c)}`)
        )
      );
    }

    const written = model.written;
    this._written.hidden = !written;
    this._written.textContent = '';
    for (const w of written ?? []) {
      this._written.appendChild(
        h(
          'li',
          { 'data-profile': w.name, 'data-what': w.what },
          w.what === 'kept'
            ? `${w.name}: kept (a profile of that name exists)`
            : `${w.name}: ${w.what}; fill in its placeholder fields before submitting`
        )
      );
    }
  }

  private _model: IDiscoveryModel;
  private _region: HTMLInputElement;
  private _profile: HTMLInputElement;
  private _discoverButton: HTMLButtonElement;
  private _addButton: HTMLButtonElement;
  private _status: HTMLDivElement;
  private _error: HTMLDivElement;
  private _list: HTMLUListElement;
  private _written: HTMLUListElement;
}
