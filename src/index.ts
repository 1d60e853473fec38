import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

export * from './tokens';

/** The id of the plugin. */
export const PLUGIN_ID = 'hyperpod-lab:plugin';

/** The id of the left-sidebar panel. */
export const SIDEBAR_ID = 'hyperpod-lab-sidebar';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2 3 7v10l9 5 9-5V7l-9-5zm0 2.3L18.9 8 12 11.7 5.1 8 12 4.3zM5 9.7l6 3.3v6.6l-6-3.3V9.7zm8 9.9V13l6-3.3v6.6l-6 3.3z"/>
  </g>
</svg>`;

/** The icon shown on the sidebar tab. */
export const hyperpodIcon = new LabIcon({
  name: 'hyperpod-lab:icon',
  svgstr: ICON_SVG
});

/**
 * The HyperPod sidebar: a heading and the list of clusters.
 *
 * The list holds a placeholder until the cluster API is wired in.
 */
export class HyperPodSidebar extends Widget {
  constructor() {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('jp-HyperPodSidebar');
    this.title.icon = hyperpodIcon;
    this.title.label = 'HyperPod';
    this.title.caption = 'HyperPod';

    const heading = document.createElement('h2');
    heading.className = 'jp-HyperPodSidebar-heading';
    heading.textContent = 'HyperPod clusters';

    const list = document.createElement('ul');
    list.className = 'jp-HyperPodSidebar-clusterList';
    const placeholder = document.createElement('li');
    placeholder.className = 'jp-HyperPodSidebar-placeholder';
    placeholder.textContent = 'No clusters configured yet.';
    list.appendChild(placeholder);

    this.node.appendChild(heading);
    this.node.appendChild(list);
    this._list = list;
  }

  /** The element holding one item per cluster. */
  get clusterList(): HTMLUListElement {
    return this._list;
  }

  private _list: HTMLUListElement;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'HyperPod cluster sidebar for JupyterLab.',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, labShell: ILabShell | null) => {
    const sidebar = new HyperPodSidebar();
    if (labShell) {
      labShell.add(sidebar, 'left', { rank: 600 });
    } else {
      app.shell.add(sidebar, 'left', { rank: 600 });
    }
  }
};

export default plugin;
