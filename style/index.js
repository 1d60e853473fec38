import './base.css';
import 'uplot/dist/uPlot.min.css';
import './dashboard.css';
import './logtriage.css';
import './submit.css';
