import './base.css';
import 'uplot/dist/uPlot.min.css';
import './dashboard.css';
import './logtriage.css';
import './queue.css';
import './submit.css';
