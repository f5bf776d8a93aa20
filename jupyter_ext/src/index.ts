/**
 * torchlens JupyterLab extension: the "GPU Monitor" sidebar.
 *
 * The data comes from the torchlens server extension (one sampler for the
 * whole server); this plugin only draws it. The panel is registered with the
 * layout restorer so it reopens where the user left it.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { GpuMonitorPanel } from './panel';

const PANEL_ID = 'torchlens-gpu-monitor';
const OPEN_COMMAND = 'torchlens:open-gpu-monitor';

const gpuIcon = new LabIcon({
  name: 'torchlens:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M3 6h18v12H3zM5 8v8h14V8z"/>' +
    '<path d="M7 10h4v4H7zM13 10h4v1.5h-4zM13 12.5h4V14h-4zM6 18h2v2H6zM10 18h2v2h-2zM14 18h2v2h-2z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'torchlens:gpu-monitor',
  description: 'Live GPU and host monitor in the sidebar.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null) => {
    const panel = new GpuMonitorPanel();
    panel.id = PANEL_ID;
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPU Monitor';
    app.shell.add(panel, 'right', { rank: 900 });
    if (restorer) {
      restorer.add(panel, PANEL_ID);
    }
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Open GPU Monitor',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'torchlens' });
  }
};

export default plugin;
