"""The orchestrator's closed loop: a measured run refits its GPU type's efficiency
(:mod:`frenzy_opt.prediction.closedloop`); the fit is stored in the job store and, when the service plans with a
calibration profile, learned into that profile; later plan searches use the refitted step-time model (a new
plan cache)."""

from __future__ import annotations

from frenzy_opt.launch.executors import ExitInfo
from frenzy_opt.planning.problem import OptionCache
from frenzy_opt.prediction.closedloop import recalibrate, sample_of
from frenzy_opt.service.faults import is_store_fault
from frenzy_opt.service.jobs import Job, Run
from frenzy_opt.service.loopstate import LoopState, log


class Learning(LoopState):
    """The closed loop (module docstring)."""

    def _learn(self, job: Job, run: Run, info: ExitInfo) -> None:
        """Closed loop: a measured run refits its GPU type's efficiency (:mod:`frenzy_opt.prediction.closedloop`);
        later plan searches use the refitted step-time model."""
        sample = sample_of(job.id, job.spec, run.option.plan, info.measured, self.cluster)
        if sample is None or info.measured.simulated:
            return
        self.samples.append(sample)
        self.sample_tenants[job.id] = job.tenant
        try:
            model, report = recalibrate([s for s in self.samples if s.key == sample.key], self.step_model)
        except ValueError:  # nothing the fitter can use (no measured run): keep the model
            return
        self.step_model = model
        self.calibration_report.update(report)
        try:
            self.store.save_calibration(report)
        except Exception as err:  # the fit lives on in memory; the next refit writes it again
            if not is_store_fault(err):
                raise
            log.warning("closed loop: cannot store the refitted efficiencies: %s", err)
        if self.calibration:  # the profile the service plans with learns from its runs
            try:
                self.calibrations.learn(self.calibration, model, report)
            except OSError as err:
                log.warning("closed loop: cannot write calibration profile %s: %s", self.calibration, err)
        self.cache = OptionCache(self.cluster, self.topology, plan_filter=self._plan_filter, step_model=self.step_model)
        self.cache.claim()
