-- plain Lua (no Neovim): lua5.4 editors/nvim/test/launch_spec.lua   (run by tests/unit/test_nvim_module.py)
package.path = arg[0]:gsub('test/launch_spec.lua$', 'lua/?.lua;') .. arg[0]:gsub('test/launch_spec.lua$', 'lua/?/init.lua;') .. package.path
local launch = require('tether.launch')
local failures = 0

local function same(got, want, what)
  local a, b = table.concat(got or { '<nil>' }, ' '), table.concat(want, ' ')
  if a ~= b then
    failures = failures + 1
    print(('FAIL %s\n  got:  %s\n  want: %s'):format(what, a, b))
  end
end

local function refused(config, pattern, what)
  local argv, why = launch.argv(config, '/home/me/proj')
  if argv or not tostring(why):find(pattern) then
    failures = failures + 1
    print(('FAIL %s: %s'):format(what, tostring(why)))
  end
end

same(launch.argv({ request = 'launch', program = '/home/me/proj/src/train.py', args = { '--lr', '3e-4' }, gpus = 1,
  backend = 'slurm', tags = { 'a' }, env = { SEED = '1', A = 'x' } }, '/home/me/proj'),
  { 'debug', '--workdir', '/home/me/proj', '--backend', 'slurm', '--gpus', '1', '--tag', 'a', '--env', 'A=x',
    '--env', 'SEED=1', '--port', '0', '--json', '-q', '--', 'python', 'src/train.py', '--lr', '3e-4' }, 'launch')
same(launch.argv({ request = 'launch', module = 'pkg.train', python = '/opt/py', profile = 'gpu' }, '/p'),
  { 'debug', '--workdir', '/p', '--profile', 'gpu', '--port', '0', '--json', '-q', '--', '/opt/py', '-m', 'pkg.train' }, 'module')
same(launch.argv({ request = 'launch', command = { 'torchrun', '--nproc-per-node', '2', 'train.py' } }, '/p'),
  { 'debug', '--workdir', '/p', '--port', '0', '--json', '-q', '--', 'torchrun', '--nproc-per-node', '2', 'train.py' }, 'command')
same(launch.argv({ request = 'attach', run = 'abcd1234', relay = 'ws://r' }, '/p'),
  { 'attach', 'abcd1234', '--relay', 'ws://r', '--port', '0', '--json', '-q' }, 'attach')
same(launch.argv({ request = 'launch', rerunOf = 'abcd1234' }, '/p'), { 'rerun', 'abcd1234', '--port', '0', '--json', '-q' }, 'rerun')
same(launch.argv({ request = 'launch', program = 'train.py', outputs = { 'out/', '*.csv' } }, '/p'),
  { 'debug', '--workdir', '/p', '--outputs', 'out/', '--outputs', '*.csv', '--port', '0', '--json', '-q', '--', 'python',
    'train.py' }, 'outputs')
same(launch.argv({ request = 'launch', program = 't.py', keepCheckpoints = 5, fromCheckpoint = 'r1:300' }, '/p'),
  { 'debug', '--workdir', '/p', '--keep-checkpoints', '5', '--from-checkpoint', 'r1:300', '--port', '0', '--json', '-q', '--',
    'python', 't.py' }, 'checkpoints')
same(launch.argv({ request = 'launch', program = 't.py', onUnattendedStop = 'suspend', unattendedFallback = 'terminate' }, '/p'),
  { 'debug', '--workdir', '/p', '--on-unattended-stop', 'suspend', '--unattended-fallback', 'terminate', '--port', '0', '--json',
    '-q', '--', 'python', 't.py' }, 'unattended')
refused({ request = 'launch' }, 'give one of', 'nothing to run')
refused({ request = 'launch', program = '/etc/passwd' }, 'inside the workdir', 'outside')
refused({ request = 'launch', program = '../x.py' }, 'inside the workdir', 'dot-dot')
refused({ request = 'attach' }, '"run" must name a run', 'attach without a run')
refused({ request = 'restart' }, '"request" must be', 'request')

local decode = function(text) -- the one line this test feeds, decoded by hand (no JSON library)
  local run, port = text:match('^{"run": "(%w+)", "port": (%d+)}$')
  if not run then error('not JSON') end
  return { run = run, port = tonumber(port) }
end
local got = launch.ready('{"run": "r1", "port": 4711}', decode)
if not got or got.run ~= 'r1' or got.port ~= 4711 then failures = failures + 1; print('FAIL ready line') end
if launch.ready('[ 0.1s] hashing', decode) or launch.ready('{broken', decode) then failures = failures + 1; print('FAIL other lines') end

print(failures == 0 and 'ok' or ('failures: ' .. failures))
os.exit(failures == 0 and 0 or 1)
