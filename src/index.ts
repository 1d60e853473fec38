/**
 * The plugin entry: builds the panel's state (`models/`), adds its views (`widgets/`) and the
 * HyperPod commands, and exports the package's public API (the contract of `api/`, the model
 * interfaces and the `IHyperPodModel` token).
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  InputDialog,
  MainAreaWidget,
  Notification,
  ToolbarButton,
  WidgetTracker
} from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { DEFAULT_SLOW_FACTOR, FAULT_KINDS, type FaultKind } from './api/faults';
import { AlertFeed } from './models/alertFeed';
import { HyperPodModel } from './models/hyperpod';
import { IHyperPodModel } from './models/tokens';
import { HyperPodSidebar, SIDEBAR_ID } from './widgets/sidebar';
import { JobDashboard } from './widgets/dashboard/dashboard';
import { queuePlugin } from './queue/plugin';
import { NotebookWidget, SubmitTabs } from './widgets/submit/tabs';

export * from './api/alerts';
export * from './api/events';
export * from './api/rest';
export * from './models/tokens';
export { HyperPodAPIError } from './api/errors';
export { FAULT_KINDS } from './api/faults';
export type { FaultKind, IFaultInfo } from './api/faults';
export { describeEvent } from './format';
export { HyperPodModel } from './models/hyperpod';
export { HyperPodSidebar, SIDEBAR_ID } from './widgets/sidebar';
export { JobDashboard } from './widgets/dashboard/dashboard';
export { SubmitPanel } from './widgets/submit/panel';

/** The id of the plugin. */
export const PLUGIN_ID = 'hyperpod-lab:plugin';

/** Command ids, all in the palette under "HyperPod". */
export namespace CommandIDs {
  export const open = 'hyperpod:open';
  export const submit = 'hyperpod:submit';
  export const refresh = 'hyperpod:refresh';
  export const cancel = 'hyperpod:cancel-selected';
  export const inject = 'hyperpod:inject-failure';
  export const discover = 'hyperpod:discover';
  export const dashboard = 'hyperpod:open-dashboard';
}

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

/** What the panel needs of a document widget (duck-typed: no notebook package needed). */
type DocWidget = Widget & {
  context?: { path?: string; model?: { dirty?: boolean }; save?: () => Promise<void> };
};

/** Whether `widget` is a notebook's document widget. */
function isNotebook(widget: Widget | null): widget is NotebookWidget {
  const path = (widget as DocWidget | null)?.context?.path;
  return typeof path === 'string' && path.endsWith('.ipynb');
}

/** Save the open notebook at `path` when it has unsaved changes. */
async function saveNotebook(app: JupyterFrontEnd, path: string): Promise<void> {
  for (const widget of app.shell.widgets('main')) {
    const context = (widget as DocWidget).context;
    if (context?.path === path && context.model?.dirty && context.save) {
      await context.save();
    }
  }
}

/**
 * The HyperPod panel: builds the state (`HyperPodModel`) once, provides it as
 * `IHyperPodModel`, and adds the sidebar, the notifications of its notices and the commands.
 */
const plugin: JupyterFrontEndPlugin<IHyperPodModel> = {
  id: PLUGIN_ID,
  description:
    'HyperPod sidebar: clusters, jobs, live fault/recovery timeline; the submit form in the main area.',
  autoStart: true,
  provides: IHyperPodModel,
  optional: [ILabShell, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ): IHyperPodModel => {
    let sidebar: HyperPodSidebar | null = null;
    const model = new HyperPodModel({
      active: () => sidebar !== null && sidebar.isVisible
    });
    const onError = (action: string, error: Error) => {
      Notification.error(`${action}: ${error.message}`, { autoClose: 10000 });
    };
    sidebar = new HyperPodSidebar({
      model,
      onError,
      openSubmit: () => void app.commands.execute(CommandIDs.submit),
      openDashboard: jobId => void app.commands.execute(CommandIDs.dashboard, { jobId })
    });
    sidebar.title.icon = hyperpodIcon;
    (labShell ?? app.shell).add(sidebar, 'left', { rank: 600 });

    model.notices.notice.connect((_, notice) => {
      if (notice.kind === 'fault') {
        Notification.error(notice.message, { autoClose: 10000 });
      } else {
        Notification.success(notice.message, { autoClose: 10000 });
      }
    });
    model.start();

    // the alerts the user's rules fired (docs/alerts.md), each shown once
    const alertFeed = new AlertFeed();
    const loadedAt = Date.now() / 1000;
    alertFeed.fired.connect((_, alert) => {
      if (alert.on === 'fault' && alert.at >= loadedAt - 5) {
        return; // a fault while the Lab is open has its own notification (above)
      }
      const text = `Alert "${alert.rule}": ${alert.text.replace(/^hyperpod-lab: /, '')}`;
      const options = {
        autoClose: 15000,
        actions: [
          {
            label: 'Dashboard',
            caption: `Open the dashboard of ${alert.job_id}`,
            callback: () => void app.commands.execute(CommandIDs.dashboard, { jobId: alert.job_id })
          }
        ]
      };
      if (alert.on === 'job_failed' || alert.on === 'fault') {
        Notification.error(text, options);
      } else {
        Notification.warning(text, options);
      }
    });
    alertFeed.start();

    const { commands } = app;
    const open = () => app.shell.activateById(SIDEBAR_ID);
    commands.addCommand(CommandIDs.open, {
      label: 'HyperPod: Open Panel',
      icon: hyperpodIcon,
      execute: open
    });
    // the submit form, in the main area: one tab per notebook, reused while open
    const submitTabs = new SubmitTabs({
      model,
      addToMain: widget => app.shell.add(widget, 'main'),
      activate: id => app.shell.activateById(id),
      saveNotebook: path => saveNotebook(app, path),
      icon: hyperpodIcon,
      onSubmitted: () => open() // the new job, selected, in the sidebar's list
    });
    commands.addCommand(CommandIDs.submit, {
      label: 'HyperPod: Submit to Cluster…',
      caption: 'Open the submit form in the main area, for the current notebook (or a script)',
      icon: hyperpodIcon,
      execute: () => {
        const current = app.shell.currentWidget;
        if (current && submitTabs.owns(current)) {
          return current; // already on a submit tab
        }
        return submitTabs.open(isNotebook(current) ? current : null);
      }
    });
    // the notebook toolbar's "Submit to cluster": the form for that notebook
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: widget => {
        // a notebook panel (duck-typed): its document context and its toolbar
        const panel = widget as NotebookWidget & { toolbar: { insertItem(i: number, name: string, w: Widget): boolean } };
        const submit = new ToolbarButton({
          icon: hyperpodIcon,
          label: 'Submit to cluster',
          tooltip: 'Submit this notebook to a HyperPod cluster (the form opens in a tab beside it)',
          onClick: () => void submitTabs.open(panel)
        });
        panel.toolbar.insertItem(10, 'hyperpod-submit', submit);
        return submit;
      }
    });
    commands.addCommand(CommandIDs.refresh, {
      label: 'HyperPod: Refresh Clusters and Jobs',
      execute: () => model.refresh()
    });
    commands.addCommand(CommandIDs.cancel, {
      label: 'HyperPod: Cancel Selected Job',
      isEnabled: () => model.selectedId !== null,
      execute: () => model.cancelSelected().catch(e => onError('Cancel', e))
    });
    commands.addCommand(CommandIDs.inject, {
      label: 'HyperPod: Inject Failure into Selected Job',
      caption:
        'kill: SIGKILL the rank; node: fail its node (Slurm: DOWN, needs an operator); ' +
        'exception: the rank raises in its next step; hang: SIGSTOP the rank (the watchdog ' +
        'catches and restarts it); slow: its steps take F times longer (a straggler)',
      isEnabled: () => model.selectedId !== null,
      // args: rank (default: the sidebar's rank field), kind (kill | node | exception | hang | slow;
      // asked when absent), factor (slow: the slowdown; asked when absent, default 2)
      execute: async args => {
        const rank =
          typeof args.rank === 'number' ? args.rank : sidebar!.jobView.faultRank;
        let kind = typeof args.kind === 'string' ? args.kind : null;
        if (kind === null) {
          const choice = await InputDialog.getItem({
            title: `Inject failure into rank ${rank}`,
            label: 'Kind of failure',
            items: [...FAULT_KINDS],
            current: 0
          });
          if (!choice.button.accept || !choice.value) {
            return;
          }
          kind = choice.value;
        }
        let factor: number | undefined =
          typeof args.factor === 'number' ? args.factor : undefined;
        if (kind === 'slow' && factor === undefined) {
          const answer = await InputDialog.getNumber({
            title: `Slow rank ${rank} down`,
            label: 'Step time factor (1 ends a slowdown)',
            value: DEFAULT_SLOW_FACTOR
          });
          if (!answer.button.accept || answer.value === null) {
            return;
          }
          factor = answer.value;
        }
        // an unknown kind or a bad factor reaches the server, whose 400 names the valid ones
        return model
          .injectFailure(rank, kind as FaultKind, kind === 'slow' ? factor : undefined)
          .catch(e => onError('Inject failure', e));
      }
    });
    commands.addCommand(CommandIDs.discover, {
      label: 'HyperPod: Discover clusters',
      caption: 'List the HyperPod clusters of an AWS region and add them as cluster profiles',
      execute: () => {
        open();
        sidebar!.openDiscover();
      }
    });
    // one dashboard tab per job, in the main area
    const dashboards = new Map<string, MainAreaWidget<JobDashboard>>();
    // open dashboards come back after a reload (the layout restorer runs the command again)
    const tracker = new WidgetTracker<MainAreaWidget<JobDashboard>>({ namespace: 'hyperpod-dashboard' });
    if (restorer) {
      void restorer.restore(tracker, {
        command: CommandIDs.dashboard,
        args: w => ({ jobId: w.content.jobId }),
        name: w => w.content.jobId
      });
    }
    commands.addCommand(CommandIDs.dashboard, {
      label: args => (args.jobId ? `HyperPod: Dashboard of ${args.jobId}` : 'HyperPod: Open Dashboard of Selected Job'),
      caption: 'Lanes per rank, loss and throughput, goodput, events and logs of a job, in a main-area tab',
      // args: jobId (default: the selected job)
      isEnabled: args => typeof args.jobId === 'string' || model.selectedId !== null,
      execute: args => {
        const jobId = typeof args.jobId === 'string' ? args.jobId : model.selectedId;
        if (!jobId) {
          return;
        }
        let widget = dashboards.get(jobId);
        if (!widget || widget.isDisposed) {
          const content = new JobDashboard({ model, jobId });
          content.title.icon = hyperpodIcon; // (MainAreaWidget takes its title from the content's)
          content.title.closable = true;
          widget = new MainAreaWidget({ content });
          widget.id = `hp-dashboard-tab-${jobId}`;
          const name = model.jobs.jobs.find(j => j.job_id === jobId)?.name ?? jobId;
          widget.title.label = `Dashboard: ${name}`;
          widget.title.caption = `HyperPod job ${jobId}`;
          widget.title.icon = hyperpodIcon;
          widget.title.closable = true;
          dashboards.set(jobId, widget);
          widget.disposed.connect(() => dashboards.delete(jobId));
          app.shell.add(widget, 'main');
          void tracker.add(widget);
        }
        app.shell.activateById(widget.id);
        return widget;
      }
    });
    model.selectionChanged.connect(() => commands.notifyCommandChanged());
    if (palette) {
      for (const command of Object.values(CommandIDs)) {
        palette.addItem({ command, category: 'HyperPod' });
      }
    }
    return model;
  }
};

export default [plugin, queuePlugin];
