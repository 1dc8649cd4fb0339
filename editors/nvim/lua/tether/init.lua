-- tether for nvim-dap: a `tether` adapter whose launch submits the run and debugs it when it
-- starts (hours later, on Slurm, Ray or a local pool), and whose attach debugs an existing run.
--
--   require('tether').setup()            -- then :DapContinue on a tether configuration
--
-- Each session starts `tether debug` (launch), `tether rerun` or `tether attach`, which serves
-- the run's adapter on 127.0.0.1 and says its port; nvim-dap speaks DAP to it. The program's
-- other processes (torchrun ranks, DataLoader workers) arrive as `startDebugging` requests for
-- the same adapter: nvim-dap opens them as child sessions. Ending the session stops serving; the
-- run goes on (`tether attach RUN` later), unless the session terminated it.
local launch = require('tether.launch')

local M = {}

local function notify(text, level)
  vim.schedule(function() vim.notify('tether: ' .. text, level or vim.log.levels.INFO) end)
end

--- Start `tether ARGV`; on_ready(run, port, job) once it serves, or an error notification.
local function serve(tether, argv, cwd, on_ready)
  local said, ready, partial = {}, false, { stdout = '', stderr = '' }
  local job
  local function on_output(_, data, stream)
    -- a chunk's last item is the start of a line that the next chunk ends
    data[1] = partial[stream] .. data[1]
    partial[stream] = table.remove(data)
    for _, line in ipairs(data) do
      local got = not ready and launch.ready(line, vim.json.decode)
      if got then
        ready = true
        vim.schedule(function() on_ready(got.run, got.port, job) end)
      elseif line ~= '' then
        said[#said + 1] = line
      end
    end
  end
  job = vim.fn.jobstart(vim.list_extend({ tether }, argv), {
    cwd = cwd,
    on_stdout = on_output,
    on_stderr = on_output,
    on_exit = function(_, code)
      if not ready then
        local why = said[#said] or ('exited with code ' .. code)
        notify(why:gsub('^tether[%w ]*:%s*', ''), vim.log.levels.ERROR)
      end
    end,
  })
  if job <= 0 then notify('could not run ' .. tether .. ' (set tether = PATH in setup)', vim.log.levels.ERROR) end
end

function M.setup(opts)
  opts = opts or {}
  local dap = require('dap')
  local tether = opts.tether or 'tether'

  dap.adapters.tether = function(callback, config)
    if config.connect then -- a child process's session: the main session's adapter serves it
      callback({ type = 'server', host = config.connect.host, port = config.connect.port })
      return
    end
    local cwd = vim.fn.getcwd()
    local argv, why = launch.argv(config, cwd)
    if not argv then return notify(why, vim.log.levels.ERROR) end
    notify(config.request == 'attach' and ('attaching to run ' .. config.run) or 'submitting the run')
    serve(tether, argv, cwd, function(run, port, job)
      if port == vim.NIL or port == nil then
        return notify('run ' .. run .. ' is not a debug run: resubmitted without the debugger')
      end
      notify('run ' .. run .. ': adapter on 127.0.0.1:' .. port)
      callback({
        type = 'server',
        host = '127.0.0.1',
        port = port,
        -- the launch names the run it submitted: tether's adapter answers it as an attach
        enrich_config = function(resolved, on_config)
          -- tetherJob: the session's own serving job, stopped when it ends (not a child's)
          on_config(vim.tbl_extend('force', resolved, { tetherRun = run, tetherJob = job }))
        end,
      })
    end)
  end

  local function stop_serving(session)
    local job = not session.parent and session.config.tetherJob
    if job then vim.fn.jobstop(job) end -- tether stops serving on SIGTERM as on Ctrl-C
  end
  dap.listeners.after.event_terminated.tether = stop_serving
  dap.listeners.after.disconnect.tether = stop_serving

  if opts.configurations ~= false then
    dap.configurations.python = dap.configurations.python or {}
    vim.list_extend(dap.configurations.python, {
      { type = 'tether', request = 'launch', name = 'tether: this file on a worker', program = '${file}' },
      { type = 'tether', request = 'launch', name = 'tether: this file with 1 GPU on Slurm', program = '${file}', backend = 'slurm', gpus = 1 },
      {
        type = 'tether', request = 'attach', name = 'tether: attach to a run',
        run = function() return vim.fn.input('run: ') end,
      },
    })
  end
end

return M
