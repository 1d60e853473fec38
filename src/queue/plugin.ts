/**
 * The "Cluster queue" plugin: adds {@link QueuePanel} to the left area with its own icon and a
 * palette command that opens it. Read-only (nothing here submits or cancels).
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { QUEUE_PANEL_ID, QueuePanel } from './panel';

/** The id of the plugin. */
export const QUEUE_PLUGIN_ID = 'hyperpod-lab:queue';

/** The command that shows the panel. */
export const QUEUE_OPEN_COMMAND = 'hyperpod:open-queue';

/** A stack of three bars (the queue) for the panel's tab. */
export const queueIcon = new LabIcon({
  name: 'hyperpod-lab:queue-icon',
  svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 4h18v4H3V4zm0 6h18v4H3v-4zm0 6h12v4H3v-4z"/>
  </g>
</svg>`
});

/** Add the panel to the left area (restored with the layout) and its palette command. */
function activateQueue(app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null): void {
  const panel = new QueuePanel();
  panel.title.icon = queueIcon;
  app.shell.add(panel, 'left', { rank: 610 });
  restorer?.add(panel, QUEUE_PANEL_ID);
  app.commands.addCommand(QUEUE_OPEN_COMMAND, {
    label: 'HyperPod: Open Cluster Queue',
    icon: queueIcon,
    execute: () => app.shell.activateById(QUEUE_PANEL_ID)
  });
  palette?.addItem({ command: QUEUE_OPEN_COMMAND, category: 'HyperPod' });
}

export const queuePlugin: JupyterFrontEndPlugin<void> = {
  id: QUEUE_PLUGIN_ID,
  description: 'Cluster queue: a Slurm cluster\'s nodes by state, partitions and every user\'s jobs (read-only).',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: activateQueue
};
