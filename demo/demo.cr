# memprof's Crystal demo (`cargo xtask demo`): a request loop that makes a lot
# of short-lived garbage and, by mistake, keeps every tenth session forever.
# `memprof run` shows where the live GC memory is; `memprof report --leaks`
# names the stack whose objects keep surviving collections: Session.new in
# remember.

class Session
  def initialize(@id : Int32, @name : String)
  end
end

SESSIONS = [] of Session

# The leak: sessions are remembered and never forgotten.
def remember(id : Int32, name : String)
  SESSIONS << Session.new(id, name)
end

def handle_request(i : Int32) : Int32
  body = "GET /item/#{i} HTTP/1.1 " * 4 # garbage: built, split, dropped
  parts = body.split(' ')
  remember(i, parts[1]) if i % 10 == 0
  parts.size
end

total = 0
100_000.times { |i| total += handle_request(i) }
puts "handled 100,000 requests (#{total} parts), #{SESSIONS.size} sessions remembered"
