class Node
  def initialize(@value : Int32, @next : Node?)
  end
end

kept = [] of Node
3.times do |round|
  head : Node? = nil
  2000.times { |i| head = Node.new(i, head) }
  kept << head.not_nil! if round == 1
  GC.collect
  sleep 0.05.seconds
end
puts kept.size
